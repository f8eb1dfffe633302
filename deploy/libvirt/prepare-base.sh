#!/usr/bin/env bash
# Prepare the OSWorld Ubuntu qcow2 as a dart VM pool base image.
#
#   deploy/libvirt/prepare-base.sh SRC.qcow2 /var/lib/dart/base/osworld.qcow2 [options]
#
# 1. copies SRC into a standalone qcow2 (no backing chain, no old snapshots);
# 2. boots it once as a temporary domain `dart-prep` on libvirt network $NETWORK;
# 3. waits until the in-guest server answers /screen_size (a probe, not a sleep);
# 4. checks xdotool in the guest (typed actions on a stock OSWorld server go through it) and
#    installs it with --install-xdotool (needs guest network; uses the image's sudo password);
# 5. with --dart-wheel W: installs dart in the guest and autostarts `dart guest-agent` on
#    port $DART_PORT (typed /action endpoint; set agent_port to it in the pool config), bound
#    to the guest NIC and wanting the per-VM token the pool hands over through fw_cfg;
# 6. shuts the guest down cleanly (ACPI), removes the temporary domain, makes the base read-only.
#
# The pool takes each VM's clean memory+disk snapshot itself, in the VM's own overlay, the
# first time the VM is ready (internal snapshots live in the overlay, not in the base).
set -euo pipefail

usage() { sed -n '2,17p' "$0"; exit 2; }
[[ $# -ge 2 ]] || usage
SRC=$1; BASE=$2; shift 2
URI=${URI:-qemu:///system}
NETWORK=${NETWORK:-default}
MEMORY_MIB=${MEMORY_MIB:-4096}
VCPUS=${VCPUS:-2}
OSWORLD_PORT=${OSWORLD_PORT:-5000}
DART_PORT=${DART_PORT:-5001}
SUDO_PASSWORD=${SUDO_PASSWORD:-password}   # the public OSWorld image's user password
READY_TIMEOUT_S=${READY_TIMEOUT_S:-600}
INSTALL_XDOTOOL=0; DART_WHEEL=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --install-xdotool) INSTALL_XDOTOOL=1 ;;
    --dart-wheel) DART_WHEEL=$2; shift ;;
    *) usage ;;
  esac
  shift
done
for tool in qemu-img virsh curl python3; do
  command -v "$tool" >/dev/null || { echo "missing $tool (apt-get install qemu-utils libvirt-clients curl python3)"; exit 1; }
done
HERE=$(cd "$(dirname "$0")" && pwd)
NAME=dart-prep
VSH=(virsh -q -c "$URI")

cleanup() { "${VSH[@]}" destroy "$NAME" >/dev/null 2>&1 || true; "${VSH[@]}" undefine "$NAME" >/dev/null 2>&1 || true; }
trap cleanup EXIT

echo "== copying $SRC -> $BASE (standalone qcow2)"
mkdir -p "$(dirname "$BASE")"
qemu-img convert -p -O qcow2 "$SRC" "$BASE"
mkdir -p "$(dirname "$BASE")/prep"

echo "== defining $NAME from $HERE/domain.xml.tmpl"
cleanup
python3 - "$HERE/domain.xml.tmpl" "$BASE" "$NETWORK" "$MEMORY_MIB" "$VCPUS" "$(dirname "$BASE")/prep" > "/tmp/$NAME.xml" <<'PY'
import string, sys, uuid
tmpl, disk, network, mem, vcpus, vm_dir = sys.argv[1:]
print(string.Template(open(tmpl).read()).substitute(
    name="dart-prep", uuid=str(uuid.uuid4()), memory_mib=mem, vcpus=vcpus, disk=disk,
    vm_dir=vm_dir, metadata="", network=network))
PY
"${VSH[@]}" define "/tmp/$NAME.xml" >/dev/null
"${VSH[@]}" start "$NAME" >/dev/null

echo "== waiting for the guest's address and its server on port $OSWORLD_PORT (up to ${READY_TIMEOUT_S}s)"
deadline=$((SECONDS + READY_TIMEOUT_S)); IP=""; delay=1
until [[ -n $IP ]] && curl -fsS -m 5 -X POST "http://$IP:$OSWORLD_PORT/screen_size" >/dev/null 2>&1; do
  (( SECONDS < deadline )) || { echo "guest not ready after ${READY_TIMEOUT_S}s (address: ${IP:-none})"; exit 1; }
  IP=$("${VSH[@]}" domifaddr "$NAME" --source lease 2>/dev/null | awk '/ipv4/ {split($4, a, "/"); print a[1]; exit}')
  sleep "$delay"; delay=$(( delay < 5 ? delay + 1 : 5 ))
done
AGENT="http://$IP:$OSWORLD_PORT"
echo "   ready at $AGENT: $(curl -fsS -X POST "$AGENT/screen_size")"

run() {  # run an argv (JSON list) in the guest, print its output, return its exit code
  local out; out=$(curl -fsS -m 900 -H 'Content-Type: application/json' -d "{\"command\": $1, \"shell\": false}" "$AGENT/execute")
  python3 -c 'import json,sys; r=json.loads(sys.argv[1]); print(r.get("output","")+r.get("error","")); sys.exit(int(r.get("returncode",1)))' "$out"
}

run_bash() {  # run a bash script in the guest; $2.. become its $1..
  run "$(python3 -c 'import json, sys; print(json.dumps(["bash", "-c", sys.argv[1], "bash", *sys.argv[2:]]))' "$@")"
}

if ! run '["xdotool", "version"]'; then
  if (( INSTALL_XDOTOOL )); then
    echo "== installing xdotool in the guest"
    run "[\"bash\", \"-c\", \"echo '$SUDO_PASSWORD' | sudo -S apt-get install -y xdotool\"]"
  else
    echo "!! xdotool missing in the guest: typed actions need it with the stock server (rerun with --install-xdotool)"
  fi
fi

if [[ -n $DART_WHEEL ]]; then
  echo "== installing dart's guest agent (port $DART_PORT)"
  W=/tmp/$(basename "$DART_WHEEL")
  curl -fsS -F "file_path=$W" -F "file_data=@$DART_WHEEL" "$AGENT/setup/upload" >/dev/null
  run "[\"python3\", \"-m\", \"pip\", \"install\", \"--user\", \"$W\"]"
  # The pool puts a fresh token per VM into QEMU's firmware config (domain.xml.tmpl); only
  # root can read it there, so a boot-time unit copies it to /run for the desktop user, and the
  # agent reads it from that file and binds only the NIC address the env worker reaches.
  read -r -d '' UNIT <<'UNIT' || true
[Unit]
Description=dart guest-agent token from QEMU fw_cfg
[Service]
Type=oneshot
ExecStart=/bin/sh -c 'modprobe qemu_fw_cfg; install -m 0400 -o "$$(id -un 1000)" /sys/firmware/qemu_fw_cfg/by_name/opt/dart/agent_token/raw /run/dart-agent-token'
[Install]
WantedBy=multi-user.target
UNIT
  run_bash "printf '%s\n' \"\$1\" > /tmp/dart-agent-token.service && echo '$SUDO_PASSWORD' | sudo -S install -m 0644 /tmp/dart-agent-token.service /etc/systemd/system/ && echo '$SUDO_PASSWORD' | sudo -S systemctl enable dart-agent-token.service" "$UNIT"
  run_bash "mkdir -p ~/.config/autostart && printf '[Desktop Entry]\nType=Application\nName=dart guest agent\nExec=%s/.local/bin/dart guest-agent --host nic --token-file /run/dart-agent-token --port $DART_PORT --display :0\n' \"\$HOME\" > ~/.config/autostart/dart-guest-agent.desktop"
fi

echo "== shutting the guest down"
"${VSH[@]}" shutdown "$NAME" >/dev/null
deadline=$((SECONDS + 300))
until [[ $("${VSH[@]}" domstate "$NAME" 2>/dev/null) == "shut off" ]]; do
  (( SECONDS < deadline )) || { echo "guest did not shut down; destroying it"; break; }
  sleep 2
done
cleanup
chmod a-w "$BASE"
echo "== base image ready: $BASE"
cat <<EOF
Pool config (YAML):
  uri: $URI
  base_image: $BASE
  template_vars: {network: $NETWORK}
  memory_mib: $MEMORY_MIB
  vcpus: $VCPUS
  agent_port: $([[ -n $DART_WHEEL ]] && echo "$DART_PORT" || echo "$OSWORLD_PORT")
EOF
