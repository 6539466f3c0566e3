"""Start a Milvus 2.3.5 standalone server on loopback for the test suite, and stop it when the test
session that asked for it ends. Runs in the server's own virtual environment (``.venv-milvus``,
made by ``make milvus-server``: the PyPI ``milvus`` package, which ships the server binary), so it
imports nothing of modelupgrade's.

    .venv-milvus/bin/python tests/milvus_server_launcher.py --cache DIR --data DIR \
        --ready FILE --watch-pid PID

* Every component listens on a free port (the package's own port search) and advertises
  127.0.0.1; its embedded etcd listens on 127.0.0.1 only, peer port included. Milvus 2.3.5 has no
  setting for the address its gRPC servers bind, which is every interface: authentication is
  therefore on (the test fixture changes the root password at once), so nothing else can use it.
* The binary is unpacked once into ``--cache`` and shared by every session's ``--data``.
* ``--ready`` gets ``{"port": …, "pid": …}`` once the server answers its health check.
* It stops the server (and removes ``--data``) when ``--watch-pid`` exits or on SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import socket
import sys
import time
from pathlib import Path

import milvus
from milvus import MilvusServer, MilvusServerConfig, _initialize_data_files

_COMPONENTS = (
    "rootCoord",
    "proxy",
    "queryCoord",
    "queryNode",
    "indexCoord",
    "indexNode",
    "dataCoord",
    "dataNode",
)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _alive(pid: int) -> bool:
    # The server binary runs on Linux only, where /proc lists every process (one we may not signal
    # included).
    return Path(f"/proc/{pid}").exists()


def _unpacked(cache: Path) -> Path:
    """The server binary and its libraries, unpacked into ``cache/bin`` once."""
    _initialize_data_files(str(cache))  # a no-op when the unpacked files match
    return cache / "bin"


def _etcd_config(data: Path, client_port: int) -> Path:
    """The embedded etcd's own configuration: every URL on 127.0.0.1, the peer port free."""
    peer = f"http://127.0.0.1:{_free_port()}"
    client = f"http://127.0.0.1:{client_port}"
    path = data / "embed-etcd.yaml"
    path.write_text(
        "\n".join(
            [
                "name: modelupgrade-tests",
                f"data-dir: {data / 'data' / 'etcd.data'}",
                f"listen-peer-urls: {peer}",
                f"initial-advertise-peer-urls: {peer}",
                f"initial-cluster: modelupgrade-tests={peer}",
                f"listen-client-urls: {client}",
                f"advertise-client-urls: {client}",
                "",
            ]
        )
    )
    return path


def _template(data: Path, into: Path, etcd_port: int) -> Path:
    """The package's configuration template with the embedded etcd's own configuration file
    named in it (the template has no such entry, and the package only sets entries it has)."""
    text = (Path(milvus.__file__).parent / "data" / "config.yaml.template").read_text()
    marker = "etcd:\n  endpoints:"
    if marker not in text:
        raise RuntimeError("the milvus package's template has no etcd section to extend")
    etcd = _etcd_config(data, etcd_port)
    text = text.replace(marker, f"etcd:\n  config:\n    path: {etcd}\n  endpoints:", 1)
    path = into / "config.yaml.template"
    path.write_text(text)
    return path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cache", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--ready", type=Path, required=True)
    parser.add_argument("--watch-pid", type=int, required=True)
    args = parser.parse_args()

    args.data.mkdir(parents=True, exist_ok=True)
    (args.data / "bin").unlink(missing_ok=True)
    (args.data / "bin").symlink_to(_unpacked(args.cache), target_is_directory=True)
    etcd_port = _free_port()
    config = MilvusServerConfig(
        data_dir=str(args.data), template=str(_template(args.data, args.data, etcd_port))
    )
    # Set only for the package's own template; the glog configuration is the package's either way.
    config.glog_conf_file = str(Path(milvus.__file__).parent / "data" / "glog.conf")
    server = MilvusServer(config)
    server.config.update(etcd_port=etcd_port, proxy_port=_free_port())
    for component in _COMPONENTS:
        server.config.set(f"{component}.ip", "127.0.0.1")
    server.config.set("authorization_enabled", True)

    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    try:
        server.start()
        args.ready.write_text(
            json.dumps({"port": server.listen_port, "pid": server.server_proc.pid})
        )
        while not stopping and _alive(args.watch_pid) and server.server_proc.poll() is None:
            time.sleep(0.5)
    finally:
        server.stop()
        shutil.rmtree(args.data, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
