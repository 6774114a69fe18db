#!/usr/bin/python3
"""One DNS query over UDP to a given server, for the test cluster's checks (dnspython, Debian's
python3-dnspython: Debian's interpreter, whatever python3 comes first on PATH).

  dns_query.py SERVER NAME [EXPECT]
      prints the response code and the A records ("NOERROR 10.0.0.1"); with EXPECT (an address or a
      response code such as NXDOMAIN or REFUSED), exits 0 only if the answer has it.
"""
import sys

import dns.exception
import dns.message
import dns.query
import dns.rcode
import dns.rdatatype


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    server, name = sys.argv[1], sys.argv[2]
    try:
        answer = dns.query.udp(dns.message.make_query(name, dns.rdatatype.A), server, timeout=2.0)
    except (OSError, dns.exception.DNSException) as e:
        print("no answer from %s: %s" % (server, e))
        return 1
    got = [dns.rcode.to_text(answer.rcode())]
    got += [r.address for rrset in answer.answer if rrset.rdtype == dns.rdatatype.A for r in rrset]
    print(" ".join(got))
    if len(sys.argv) == 4:
        return 0 if sys.argv[3] in got else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
