"""The PostgreSQL backend (config.pg_backend), plus: start the embedded server (common.embedded_db) before connecting.

Used only when DATABASE_URL is unset. Starting lazily keeps settings import free of side effects.
"""

from urllib.parse import urlsplit

from psycopg import OperationalError

from common import embedded_db
from config.pg_backend import base


class DatabaseWrapper(base.DatabaseWrapper):
    _server_checked = False

    def get_new_connection(self, conn_params):
        if not DatabaseWrapper._server_checked:
            self._follow(embedded_db.ensure_running(), conn_params)
            DatabaseWrapper._server_checked = True
        try:
            return super().get_new_connection(conn_params)
        except OperationalError:
            # Stopped under us (`sapo_db stop`, a reboot): start it again once, then connect.
            self._follow(embedded_db.ensure_running(), conn_params)
            return super().get_new_connection(conn_params)

    def _follow(self, url: str, conn_params: dict) -> None:
        """Connect where the server listens: the settings read the port before it started, and a
        server that found the default port taken (another checkout's) listens on another one."""
        port = urlsplit(url).port
        if str(self.settings_dict.get("PORT")) != str(port):
            self.settings_dict["PORT"] = port  # shared by every thread's wrapper, and read by the pool
            if self.alias in self._connection_pools:  # a pool made already connects to the old port
                self.close_pool()
        conn_params["port"] = port
