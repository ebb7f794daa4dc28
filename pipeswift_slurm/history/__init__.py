"""Run folders and the SQLite history: a run directory read (`rundir`, `eventfold`, `rows`), the
store (`store`: ingest, migrations in `schema`, reads in `queries`, SQL views in `views`) and
sacct's job selection (`selection`)."""
