"""The PostgreSQL backend, plus: start the embedded server (common.embedded_db) before connecting.

Used only when DATABASE_URL is unset. Starting lazily keeps settings import free of side effects.
"""

from django.db.backends.postgresql import base
from psycopg import OperationalError

from common import embedded_db


class DatabaseWrapper(base.DatabaseWrapper):
    _server_checked = False

    def get_new_connection(self, conn_params):
        if not DatabaseWrapper._server_checked:
            embedded_db.ensure_running()
            DatabaseWrapper._server_checked = True
        try:
            return super().get_new_connection(conn_params)
        except OperationalError:
            # Stopped under us (`sapo_db stop`, a reboot): start it again once, then connect.
            embedded_db.ensure_running()
            return super().get_new_connection(conn_params)
