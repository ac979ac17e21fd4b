#!/bin/sh
# Regenerate api_pb2.py and api_pb2_grpc.py from api.proto with grpcio-tools.
# Run from anywhere; uses the repository's venv when there is one.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
plugin_root=$(cd "$here/../.." && pwd)          # .../plugin, so imports read vgpu_plugin.deviceplugin
repo=$(cd "$plugin_root/.." && pwd)
python=${PYTHON:-$repo/.venv/bin/python}
[ -x "$python" ] || python=python3
"$python" -m grpc_tools.protoc -I "$plugin_root" \
  --python_out="$plugin_root" --grpc_python_out="$plugin_root" \
  "$plugin_root/vgpu_plugin/deviceplugin/api.proto"
echo "regenerated stubs in $here"
