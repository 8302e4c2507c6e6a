"""Foundation shared by every package (the bottom layer of docs/architecture.md, layout).

Owns: bearer-token credentials (`common.credentials`), the correlation id (`common.correlation`),
strict query parameters (`common.strict_query`), structured logging (`common.logs`), the database
pool and the migration runner with the per-component roles (`common.pgutil`, `common.migrate`,
`common.db_roles`), which database errors are an outage and answering them 503
(`common.outage`), the lock-key format (`common.lockkey`), the one launcher of the HTTP
services (`common.launcher`), lazy package exports (`common.lazy`), the process exit and
start-up refusals (`common.exiting`), the container health probe (`common.healthcheck`), and
distributed tracing with its local trace files (`common.tracing`, `common.tracefile`).
Must never: import anything of the project (every other package may import it, so an import of
a component here would turn the layering upside down; `make lint` enforces it), hold domain
logic of a component, hold a token in source, or log one.
"""
