#!/usr/bin/env bash
# The wheels a GPU node needs to install personalens with a given vLLM release, for nodes without
# internet access. Run it on a machine that has internet access and the node's Python environment
# (a login node with the same image, or the node's venv on a shared filesystem): pip resolves
# vLLM and personalens's dependencies against what that Python has installed, keeps the installed
# torch (a release that needs another torch is refused), and downloads only what is missing.
#
#   scripts/wheelhouse.sh 0.26.0 /shared/wheels/vllm-0.26.0      # PYTHON=/path/to/python to choose
#   # then, on the node:
#   pip install --no-index --find-links /shared/wheels/vllm-0.26.0 -e '.[gpu]' 'vllm==0.26.0'
set -euo pipefail
version=${1:?usage: scripts/wheelhouse.sh VLLM_VERSION [DIR]}
dir=$(realpath -m "${2:-wheelhouse-vllm-$version}")
python=${PYTHON:-python3}
repo=$(cd "$(dirname "$0")/.." && pwd)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# torch, and the torchvision/torchaudio built for it, stay at their installed versions
"$python" - >"$work/constraints.txt" <<'EOF'
from importlib import metadata
for name in ("torch", "torchvision", "torchaudio"):
    try:
        print(f"{name}=={metadata.version(name)}")
    except metadata.PackageNotFoundError:
        if name == "torch":
            raise SystemExit("torch is not installed in this Python: install the node's torch first")
EOF
echo "keeping: $(tr '\n' ' ' <"$work/constraints.txt")"

# what `pip install` would add to this environment, resolved without installing anything
if ! "$python" -m pip install --quiet --dry-run --report "$work/report.json" -c "$work/constraints.txt" \
    "vllm==$version" "$repo[gpu]" 2>"$work/pip.err"; then
    cat "$work/pip.err" >&2
    echo "vLLM $version cannot be installed beside this environment's torch (above)" >&2
    exit 1
fi
"$python" - "$work/report.json" >"$work/urls.txt" <<'EOF'
import json, sys
for item in json.load(open(sys.argv[1]))["install"]:
    if not item["download_info"]["url"].startswith("file:"):  # personalens itself, from this clone
        print(item["download_info"]["url"])
EOF
mkdir -p "$dir"
xargs -a "$work/urls.txt" "$python" -m pip download --quiet --no-deps -d "$dir"
echo "$(wc -l <"$work/urls.txt") wheels for vllm==$version in $dir ($(du -sh "$dir" | cut -f1))"
