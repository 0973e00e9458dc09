#!/bin/sh
# Runs replay.py in a virtualenv of the pinned requirements, made on first use under
# ${IDEM_PEER_VENV:-$HOME/.cache/idem/powertools-<hash of requirements.txt>}.
# Usage: run.sh --redis-url URL --prefix PREFIX --seconds S
set -eu
here=$(cd "$(dirname "$0")" && pwd)
hash=$(sha256sum "$here/requirements.txt" | cut -c1-12)
venv=${IDEM_PEER_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/idem/powertools-$hash}
if [ ! -x "$venv/bin/python" ] || [ ! -f "$venv/.complete" ]; then
    python3 -m venv "$venv" >&2
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$here/requirements.txt" >&2
    touch "$venv/.complete"
fi
exec "$venv/bin/python" "$here/replay.py" "$@"
