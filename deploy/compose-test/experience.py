"""`make compose-test`'s stand-in for a warm start: one successful trajectory per training task
into the experience pool, through `dart experience import`.

The compose stack starts from a tiny random policy (model-init), which never solves a task, and
the batcher keeps a group only when it holds a success (DART injects a pool success into a group
whose rollouts all failed). With an empty pool no batch is ever made and the trainer publishes
nothing. Each pool trajectory here is one step on a blank screenshot answering `finished()`,
made with the tokenizer of the policy in the models volume only: enough for the batcher. The
trainer drops that step (its prompt_hash is empty: no rollout built its prompt) and trains on
the group's own rollouts, so this tests the plumbing, not learning. Usage (in the dart image, broker at $DART_BOOTSTRAP, volumes mounted):
    python experience.py /data/models/policy /data/blobs RUN_ID
"""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image
from transformers import AutoTokenizer

ANSWER = "Action: finished()"
SCREEN = (112, 112)


def main(model: str, blobs: str, run_id: str) -> None:
    out = subprocess.run(["dart", "tail", "tasks"], capture_output=True, text=True, check=True).stdout
    tasks = {}
    for line in out.splitlines():
        row = json.loads(line)
        if row.get("split") == "train" and row.get("task_id"):
            tasks[row["task_id"]] = row["instruction"]
    if not tasks:
        sys.exit("experience: no training task on the tasks topic")
    tok = AutoTokenizer.from_pretrained(model)
    ids = tok(ANSWER, add_special_tokens=False)["input_ids"] + ([tok.eos_token_id] if tok.eos_token_id is not None else [])
    with tempfile.TemporaryDirectory() as tmp:
        Image.new("RGB", SCREEN, "white").save(Path(tmp) / "blank.png")
        lines = [json.dumps({"task_id": task_id, "instruction": instruction, "reward": 1.0,
                             "screen_width": SCREEN[0], "screen_height": SCREEN[1],
                             "steps": [{"screenshot": "blank.png", "response_text": ANSWER, "response_token_ids": ids}]})
                 for task_id, instruction in sorted(tasks.items())]
        (Path(tmp) / "pool.jsonl").write_text("\n".join(lines) + "\n")
        subprocess.run(["dart", "experience", "import", str(Path(tmp) / "pool.jsonl"), "--blobs", blobs,
                        "--run-id", run_id], check=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
