#!/usr/bin/env python3
"""Publish one message whose headers nest DEPTH tables deep to QUEUE on a
local RabbitMQ (guest/guest), over a raw AMQP 0-9-1 connection.

    python3 publish_deep_headers.py QUEUE [DEPTH]   (default 1000)
"""
import socket, struct, sys

queue, depth = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1000

def frame(kind, channel, payload):
    return struct.pack(">BHI", kind, channel, len(payload)) + payload + b"\xce"

def method(channel, class_id, method_id, args=b""):
    return frame(1, channel, struct.pack(">HH", class_id, method_id) + args)

def shortstr(s):
    return bytes([len(s)]) + s

def read_method(sock):
    while True:
        kind, _, size = struct.unpack(">BHI", sock.recv(7, socket.MSG_WAITALL))
        payload = sock.recv(size + 1, socket.MSG_WAITALL)[:-1]
        if kind == 1:
            return struct.unpack(">HH", payload[:4])

# Each table holds the next under the key "a"; the innermost is empty.
headers = b""
for level in range(depth):
    headers += struct.pack(">I", (depth - 1 - level) * 7)
    if level + 1 < depth:
        headers += b"\x01aF"

sock = socket.create_connection(("127.0.0.1", 5672))
sock.sendall(b"AMQP\x00\x00\x09\x01")
assert read_method(sock) == (10, 10)  # connection.start
sock.sendall(method(0, 10, 11, b"\0\0\0\0" + shortstr(b"PLAIN")
                    + struct.pack(">I", 12) + b"\0guest\0guest" + shortstr(b"en_US")))
assert read_method(sock) == (10, 30)  # connection.tune
sock.sendall(method(0, 10, 31, struct.pack(">HIH", 1, 131072, 0)))
sock.sendall(method(0, 10, 40, shortstr(b"/") + b"\0\0"))
assert read_method(sock) == (10, 41)  # connection.open-ok
sock.sendall(method(1, 20, 10, b"\0"))
assert read_method(sock) == (20, 11)  # channel.open-ok
sock.sendall(method(1, 85, 10, b"\0"))
assert read_method(sock) == (85, 11)  # confirm.select-ok
body = b"hello"
sock.sendall(method(1, 60, 40, b"\0\0" + shortstr(b"") + shortstr(queue.encode()) + b"\0")
             + frame(2, 1, struct.pack(">HHQH", 60, 0, len(body), 1 << 13) + headers)
             + frame(3, 1, body))
assert read_method(sock) == (60, 80)  # basic.ack: the broker has it
sock.sendall(method(0, 10, 50, struct.pack(">H", 200) + shortstr(b"") + b"\0\0\0\0"))
assert read_method(sock) == (10, 51)
print(f"published to {queue}: headers {depth} tables deep ({len(headers)} bytes)")
