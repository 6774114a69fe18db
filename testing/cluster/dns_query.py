#!/usr/bin/env python3
"""One DNS query over UDP, for the test cluster's checks (the machine has no dig).

  dns_query.py SERVER NAME [EXPECT]
      prints the response code and the A records ("NOERROR 10.0.0.1"); with EXPECT (an address or a
      response code such as NXDOMAIN or REFUSED), exits 0 only if the answer has it.
"""
import random
import socket
import struct
import sys

RCODES = {0: "NOERROR", 1: "FORMERR", 2: "SERVFAIL", 3: "NXDOMAIN", 4: "NOTIMP", 5: "REFUSED"}


def skip_name(msg, i):
    while True:
        n = msg[i]
        if n & 0xC0 == 0xC0:
            return i + 2
        if n == 0:
            return i + 1
        i += n + 1


def query(server, name, timeout=2.0):
    qid = random.randrange(1 << 16)
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.rstrip(".").split("."))
    packet = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0) + labels + b"\0" + struct.pack(">HH", 1, 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout)
        s.sendto(packet, (server, 53))
        while True:
            msg, _ = s.recvfrom(4096)
            if len(msg) >= 12 and struct.unpack(">H", msg[:2])[0] == qid:
                break
    rcode = RCODES.get(msg[3] & 0xF, str(msg[3] & 0xF))
    qd, an = struct.unpack(">HH", msg[4:8])
    i = 12
    for _ in range(qd):
        i = skip_name(msg, i) + 4
    addrs = []
    for _ in range(an):
        i = skip_name(msg, i)
        rtype, _, _, length = struct.unpack(">HHIH", msg[i:i + 10])
        i += 10
        if rtype == 1 and length == 4:
            addrs.append(socket.inet_ntoa(msg[i:i + 4]))
        i += length
    return rcode, addrs


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    try:
        rcode, addrs = query(sys.argv[1], sys.argv[2])
    except OSError as e:
        print("no answer from %s: %s" % (sys.argv[1], e))
        return 1
    print(" ".join([rcode] + addrs))
    if len(sys.argv) == 4:
        return 0 if sys.argv[3] in [rcode] + addrs else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
