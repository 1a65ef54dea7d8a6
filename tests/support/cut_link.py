"""A TCP relay a test puts between a client and a server so that it can cut the client's
connections when it likes (as a network blip does), while new ones still get through."""
import selectors
import socket
import threading


class CutLink:
    """Relays every connection to ``127.0.0.1:port`` of its own (``endpoint``) to
    ``target`` (host, port); :meth:`cut` drops the connections it relays now."""

    def __init__(self, target):
        self._target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"tcp://127.0.0.1:{self._listener.getsockname()[1]}"
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ)
        self._pairs = {}            # socket -> the socket it relays to
        self._cut = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="cut-link", daemon=True)
        self._thread.start()

    def cut(self):
        """Close every connection relayed now (the next ones get through)."""
        self._cut.set()

    def close(self):
        self._stop = True
        self._thread.join(5)
        for s in [self._listener, *self._pairs]:
            s.close()

    def _drop_all(self):
        for s in list(self._pairs):
            self._sel.unregister(s)
            s.close()
        self._pairs.clear()

    def _run(self):
        while not self._stop:
            if self._cut.is_set():
                self._cut.clear()
                self._drop_all()
            for key, _ in self._sel.select(0.02):
                s = key.fileobj
                if s is self._listener:
                    client, _ = s.accept()
                    try:
                        server = socket.create_connection(self._target, timeout=2)
                    except OSError:
                        client.close()
                        continue
                    for a, b in ((client, server), (server, client)):
                        self._pairs[a] = b
                        self._sel.register(a, selectors.EVENT_READ)
                    continue
                if s not in self._pairs:
                    continue
                try:
                    data = s.recv(65536)
                except OSError:
                    data = b""
                other = self._pairs[s]
                if not data:
                    for x in (s, other):
                        self._sel.unregister(x)
                        self._pairs.pop(x, None)
                        x.close()
                    continue
                other.sendall(data)
