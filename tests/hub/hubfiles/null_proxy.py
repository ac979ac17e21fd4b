"""A JupyterHub Proxy that keeps routes in memory: the tests talk to the Hub API directly,
so configurable-http-proxy (an npm package) is not needed."""

from jupyterhub.proxy import Proxy


class MemoryProxy(Proxy):
    should_start = False

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.routes = {}

    async def add_route(self, routespec, target, data):
        self.routes[routespec] = {"routespec": routespec, "target": target, "data": data}

    async def delete_route(self, routespec):
        self.routes.pop(routespec, None)

    async def get_all_routes(self):
        return dict(self.routes)
