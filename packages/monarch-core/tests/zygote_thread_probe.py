"""A module that starts a thread when imported: a zygote that preloads it may not fork."""

import threading

STOP = threading.Event()
threading.Thread(target=STOP.wait, daemon=True).start()
