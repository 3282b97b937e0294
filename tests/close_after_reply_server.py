"""An HTTP/1.0 server that closes each connection right after its reply, for
tests/test_cluster.py: POST /add adds one to a counter, GET /count answers
it. The leader logs each connection's CLOSE after its request; a backup's
server closes its copy itself, maybe before it reads that EOF.

    python3 tests/close_after_reply_server.py PORT
"""

import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

count = 0


class Handler(BaseHTTPRequestHandler):
    def answer(self, body):
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        global count
        count += 1
        self.answer(b"added\n")

    def do_GET(self):
        self.answer(b"%d\n" % count)

    def log_message(self, *args):
        pass

    def date_time_string(self, timestamp=None):
        return "-"  # no Date header: the replicas answer at other moments


HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
