"""The guest image's cloud-init process (images/debian12/files/cloud-init-boot) leaves out the
libraries it never needs at start-up: run here, in a child Python, against stand-ins of those
libraries built in a temporary folder (the host has no cloud-init), as cloud-init imports them."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

BOOT = Path(__file__).resolve().parents[2] / "images" / "debian12" / "files" / "cloud-init-boot"

# What cloud-init 22.4's url_helper does with requests at import time: the module and its
# exceptions submodule imported, one class read in an annotation and one in a default argument.
CLIENT = '''
import requests
from requests import exceptions

class UrlResponse:
    def __init__(self, response: requests.Response):
        self.response = response

def retry_on_url_exc(exc, retry_instances=(requests.Timeout,)):
    return isinstance(exc, retry_instances)
'''

# A stand-in for requests that says when it is really imported.
REQUESTS = '''
import os
os.environ["REAL_REQUESTS_IMPORTED"] = "1"
from requests import exceptions
from requests.exceptions import Timeout
class Response: pass
class Session:
    def get(self, url): raise exceptions.ConnectionError(url)
'''
EXCEPTIONS = '''
class RequestException(IOError): pass
class Timeout(RequestException): pass
class ConnectionError(RequestException): pass
'''

CHECK = '''
import importlib.machinery, importlib.util, os, sys
loader = importlib.machinery.SourceFileLoader("cloud_init_boot", sys.argv[1])
boot = importlib.util.module_from_spec(importlib.util.spec_from_loader("cloud_init_boot", loader))
loader.exec_module(boot)
boot.defer_imports()
for name in boot.ABSENT:
    try:
        __import__(name)
    except ImportError:
        pass
    else:
        raise SystemExit(f"{name} imported")
import client
assert "REAL_REQUESTS_IMPORTED" not in os.environ, "requests imported with cloud-init"
# used: the real module is imported and answers, its exceptions match the stand-in classes
from requests import exceptions
try:
    client.requests.Session().get("http://198.18.0.1/")
except client.exceptions.RequestException as e:
    assert client.retry_on_url_exc(exceptions.Timeout()) and not client.retry_on_url_exc(e)
assert os.environ.get("REAL_REQUESTS_IMPORTED") == "1"
assert type(sys.modules["requests"]) is type(os)
# a constant read at import time (url_helper's NOT_FOUND) is there without http.client or ssl
from http.client import NOT_FOUND
assert NOT_FOUND == 404 and "ssl" not in sys.modules
# a deferred module used through its package, as `import http.client` code does, is the real one
import http.client
assert http.client.HTTPConnection.__module__ == "http.client" and "ssl" in sys.modules
assert type(sys.modules["http.client"]) is type(os) and http.client.NOT_FOUND == NOT_FOUND
# deferred cloud-init modules whose package is not here (the host has no cloud-init) are left
# for an import that would fail as before
assert "cloudinit" not in sys.modules
print("ok")
'''


def test_deferred_and_absent_imports(tmp_path):
    (tmp_path / "requests").mkdir()
    (tmp_path / "requests" / "__init__.py").write_text(textwrap.dedent(REQUESTS))
    (tmp_path / "requests" / "exceptions.py").write_text(textwrap.dedent(EXCEPTIONS))
    (tmp_path / "client.py").write_text(textwrap.dedent(CLIENT))
    (tmp_path / "check.py").write_text(CHECK)
    p = subprocess.run([sys.executable, str(tmp_path / "check.py"), str(BOOT)], capture_output=True,
                       text=True, timeout=60, cwd=tmp_path)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr[-2000:]
