"""The local HTTP API both the HTTP publisher and the plain load generator send to.

python -m bench.http_server PORT      # answers 200 to every POST, as fast as it can
"""

from __future__ import annotations

import sys

from aiohttp import web


async def accept(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(text="{}", content_type="application/json")


def main() -> None:
    app = web.Application()
    app.router.add_post("/events", accept)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)


if __name__ == "__main__":
    main()
