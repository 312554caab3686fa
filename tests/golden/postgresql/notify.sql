SELECT pg_notify(%(channel)s::VARCHAR, %(pg_notify_2)s::VARCHAR) AS pg_notify_1
