"""What people read: JCT breakdowns (`jct`), sreport-style accounting (`accounting`), the
Datasette server, sacct-style tables, watching a job and its log, and `doctor`'s checks."""
