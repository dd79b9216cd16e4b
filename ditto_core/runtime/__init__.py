"""Running a build: the ``ditto-run`` executable (``runtime.run``) and the runtime's C API
through ctypes (``runtime.runtime_api``)."""
