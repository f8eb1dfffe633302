"""OSWorld's app getters on a slot: VLC's and GIMP's settings files, VLC's playing state
(through its HTTP interface, which the setup starts on a free port with every ``vlc``), and
files pulled out of a presentation's slide.
"""

from __future__ import annotations

import io
import posixpath
from typing import Any

import aiohttp

from dart.env.evaluators.files import FileContent
from dart.env.xdesktop.getter_table import GetterTable
from dart.errors import ConfigError, EnvError

GIMP_VERSION = "2.10"
"""The GIMP settings folder (~/.config/GIMP/<version>) Debian's GIMP writes."""

getter = GetterTable("application")
"""``@getter("name")`` defines a getter; ``register_all`` hands them to the evaluator registry."""


async def _file(env: Any, path: str) -> FileContent | None:
    try:
        return FileContent(path, await env.read_file(path))
    except FileNotFoundError:
        return None


@getter("vlc_config")
async def vlc_config(env: Any, params: dict[str, Any], ctx: Any) -> FileContent | None:
    return await _file(env, "~/.config/vlc/vlcrc")


@getter("gimp_config_file")
async def gimp_config_file(env: Any, params: dict[str, Any], ctx: Any) -> FileContent | None:
    name = params.get("file_name")
    if not isinstance(name, str) or "/" in name:
        raise ConfigError(f"gimp_config_file: file_name must be a file name, got {name!r}")
    return await _file(env, f"~/.config/GIMP/{GIMP_VERSION}/{name}")


@getter("vlc_playing_info")
async def vlc_playing_info(env: Any, params: dict[str, Any], ctx: Any) -> FileContent | None:
    """VLC's /requests/status.xml (None if no VLC with its HTTP interface is running)."""
    vlc = ctx.extras.get("vlc")
    if vlc is None or vlc.port is None:
        return None
    url = f"http://127.0.0.1:{vlc.port}/requests/status.xml"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session, \
                session.get(url, auth=aiohttp.BasicAuth("", vlc.password)) as resp:
            return FileContent("status.xml", await resp.read()) if resp.status == 200 else None
    except aiohttp.ClientConnectionError:
        return None  # VLC is not running (anymore): nothing is playing
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise EnvError(f"VLC's HTTP interface did not answer: {exc}") from exc


def _slide_part(data: bytes, slide_index: int, kind: str) -> bytes | None:
    """The bytes of the first audio (``kind='audio'``) or background picture (``'image'``) a
    slide links to (pure; python-pptx's relationships)."""
    from pptx import Presentation

    slides = list(Presentation(io.BytesIO(data)).slides)
    if not 0 <= slide_index < len(slides):
        return None
    slide = slides[slide_index]
    for rel in slide.part.rels.values():
        if rel.is_external:
            continue
        if (kind == "audio" and ("audio" in rel.reltype or "media" in rel.reltype)
                and rel.target_part.content_type.startswith("audio")):
            return rel.target_part.blob
        if kind == "image" and "image" in rel.reltype:
            return rel.target_part.blob
    return None


async def _from_slide(env: Any, params: dict[str, Any], kind: str) -> FileContent | None:
    path = params.get("ppt_file_path")
    if not isinstance(path, str):
        raise ConfigError(f"{kind} in slide: ppt_file_path must be a path, got {path!r}")
    deck = await _file(env, path)
    if deck is None:
        return None
    try:
        blob = _slide_part(deck.data, int(params.get("slide_index", 0)), kind)
    except Exception:  # not a readable deck: nothing to score
        return None
    return None if blob is None else FileContent(posixpath.basename(str(params.get("dest", kind))), blob)


@getter("audio_in_slide")
async def audio_in_slide(env: Any, params: dict[str, Any], ctx: Any) -> FileContent | None:
    return await _from_slide(env, params, "audio")


@getter("background_image_in_slide")
async def background_image_in_slide(env: Any, params: dict[str, Any], ctx: Any) -> FileContent | None:
    return await _from_slide(env, params, "image")


register_all = getter.register_all
