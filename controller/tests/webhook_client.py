"""A real TLS client (Python's ssl, i.e. OpenSSL) for the webhook tests: verifies the server's
certificate against a CA file and the host name, sends one request, prints the outcome as JSON.

usage: webhook_client.py CAFILE HOST PORT METHOD PATH [BODYFILE] [--chunked] [--connect=ADDR]

--connect=ADDR connects to ADDR but still verifies the certificate for HOST (a Service's DNS
name, say, served on 127.0.0.1 by the test).

Prints {"status": int, "body": str, "peer_cn": str} or {"error": str} (a TLS or connection
failure), and exits 0 either way so the test reads the outcome from stdout.
"""

import http.client
import json
import socket
import ssl
import sys


class Connection(http.client.HTTPSConnection):
    """An HTTPS connection that may dial another address than the name it verifies."""

    connect_to = None

    def connect(self):
        if self.connect_to is None:
            return super().connect()
        sock = socket.create_connection((self.connect_to, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    chunked = "--chunked" in sys.argv
    connect = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--connect=")), None)
    cafile, host, port, method, path = args[:5]
    body = open(args[5], "rb").read() if len(args) > 5 else None
    context = ssl.create_default_context(cafile=cafile)
    try:
        conn = Connection(host, int(port), context=context, timeout=20)
        conn.connect_to = connect
        headers = {"Content-Type": "application/json"}
        if chunked and body is not None:
            pieces = (body[i:i + 65536] for i in range(0, len(body), 65536))
            conn.request(method, path, body=pieces, headers=headers, encode_chunked=True)
        else:
            conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        peer = conn.sock.getpeercert() if conn.sock else {}
        cn = ""
        for rdn in peer.get("subject", ()):
            for key, value in rdn:
                if key == "commonName":
                    cn = value
        out = {"status": response.status, "body": response.read().decode("utf-8", "replace"),
               "peer_cn": cn}
    except (ssl.SSLError, OSError, http.client.HTTPException) as e:
        out = {"error": f"{type(e).__name__}: {e}"}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
