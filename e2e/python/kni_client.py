#!/usr/bin/env python3
"""A KNI client generated from the KNI project's own api.proto, as a runtime would build it.

Usage: kni_client.py PROTO_DIR SOCKET
  PROTO_DIR holds the upstream api.proto (shared/fixtures/kni); grpcio-tools' protoc generates
  the Python messages and the KNI stub from it into a temporary directory at start.
  Then one JSON object per stdin line: {"method": "AttachInterface", "request": {...}} (the
  request in protobuf's JSON mapping, field names as in the .proto). One JSON line answers each:
  {"ok": {...response...}} or {"error": "FAILED_PRECONDITION", "details": "..."}.
  The first line printed is {"ready": "<grpcio version>"} once the stubs are generated.
Exits 3 when grpcio or grpcio-tools is missing, 2 on bad arguments.
"""
import importlib
import json
import os
import sys
import tempfile

try:
    import grpc
    from grpc_tools import protoc
    from google.protobuf import json_format
except ImportError as e:
    sys.stderr.write(f"python grpcio/grpcio-tools is not installed ({e}): "
                     "python3 -m pip install grpcio==1.85.1 grpcio-tools==1.85.1\n")
    sys.exit(3)


def generate(proto_dir, out):
    args = ["protoc", f"-I{proto_dir}", f"--python_out={out}", f"--grpc_python_out={out}",
            os.path.join(proto_dir, "api.proto")]
    # protoc needs the well-known types' include path grpc_tools ships.
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    args.insert(1, f"-I{include}")
    if protoc.main(args) != 0:
        sys.stderr.write("protoc failed on " + proto_dir + "/api.proto\n")
        sys.exit(4)
    sys.path.insert(0, out)
    return importlib.import_module("api_pb2"), importlib.import_module("api_pb2_grpc")


def main():
    if len(sys.argv) != 3:
        sys.stderr.write(__doc__)
        sys.exit(2)
    proto_dir, socket = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory(prefix="knt-kni-py-") as out:
        pb, pb_grpc = generate(proto_dir, out)
        print(json.dumps({"ready": grpc.__version__}), flush=True)
        with grpc.insecure_channel("unix:" + socket) as channel:
            stub = pb_grpc.KNIStub(channel)
            for line in sys.stdin:
                if not line.strip():
                    continue
                call = json.loads(line)
                method = call["method"]
                request = json_format.ParseDict(call.get("request", {}),
                                                getattr(pb, method + "Request")())
                try:
                    response = getattr(stub, method)(request, timeout=30)
                    answer = {"ok": json_format.MessageToDict(
                        response, preserving_proto_field_name=True)}
                except grpc.RpcError as e:
                    answer = {"error": e.code().name, "details": e.details() or ""}
                print(json.dumps(answer), flush=True)


main()
