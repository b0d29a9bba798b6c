"""fleet workload: maps its "weights" (a file of the node), keeps state in memory, answers on a TCP port."""
import hashlib
import mmap
import os
import socket
import threading
import time

PORT = int(os.environ.get("FLEET_PORT", "18932"))
with open("/opt/fleet/weights.bin", "rb") as handle:
    weights = mmap.mmap(handle.fileno(), 0, prot=mmap.PROT_READ)
state = {"n": 0, "token": os.urandom(8).hex(), "weights": hashlib.sha256(weights).hexdigest()}
blob = bytearray(os.urandom(16 << 20))
digest = hashlib.sha256(blob).hexdigest()
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", PORT))
srv.listen(8)


def serve():
    while True:
        conn, _addr = srv.accept()
        with conn:
            ok = hashlib.sha256(blob).hexdigest() == digest
            conn.sendall(("%s %d %s %s\n" % (state["token"], state["n"], ok, socket.gethostname())).encode())


threading.Thread(target=serve, daemon=True).start()
with open(os.path.join(os.environ["SNAPSHOT_CONTROL_DIR"], "ready-for-snapshot"), "w") as handle:
    handle.write(state["token"])
while True:
    state["n"] += 1
    time.sleep(0.05)
