"""Ask the fleet workload on this node for its state; prints: token counter memory_ok hostname."""
import socket
import sys
import time

end = time.monotonic() + 20
while True:
    try:
        with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5) as sock:
            print(sock.recv(200).decode().strip())
            break
    except OSError:
        if time.monotonic() > end:
            raise
        time.sleep(0.2)
