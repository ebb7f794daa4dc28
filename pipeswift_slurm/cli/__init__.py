"""The `pswift` command: options and printing over the library (user commands in `main`, the
admin's in `admin` and `reports`, what they share in `common`). Nothing below imports it."""
