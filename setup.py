"""The optional native part of pydblog (everything else is in pyproject.toml).

``pydblog.sources.postgres._copyenc`` (C, no dependency but CPython's headers) encodes
snapshot chunks read as COPY text; ``optional=True``: a machine without a C compiler
or Python's headers still installs pydblog, which then reads chunks by the SQL path and
says so in its log.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "pydblog.sources.postgres._copyenc",
            ["src/pydblog/sources/postgres/_copyenc.c"],
            extra_compile_args=["-O2", "-std=c99", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            libraries=["dl"],
            optional=True,
        )
    ]
)
