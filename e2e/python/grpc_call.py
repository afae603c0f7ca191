#!/usr/bin/env python3
"""One unary gRPC call through Python's grpcio (gRPC C-core), as a real non-Go client makes it.

Usage: grpc_call.py TARGET METHOD REQUEST_HEX | grpc_call.py --version
Prints "ok <response hex>" on success, "error <STATUS_CODE> <details>" on a gRPC error.
Exits non-zero only when grpcio itself is missing or the arguments are wrong.
"""
import sys

try:
    import grpc
except ImportError:
    sys.stderr.write("python grpcio is not installed\n")
    sys.exit(3)


def main():
    if sys.argv[1:] == ["--version"]:
        print(grpc.__version__)
        return
    if len(sys.argv) != 4:
        sys.stderr.write(__doc__)
        sys.exit(2)
    target, method, request = sys.argv[1], sys.argv[2], bytes.fromhex(sys.argv[3])
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(method)  # bytes in, bytes out: no generated stubs needed
        try:
            response = call(request, timeout=10)
        except grpc.RpcError as e:
            print("error", e.code().name, (e.details() or "").replace("\n", " "))
            return
    print("ok", response.hex())


main()
