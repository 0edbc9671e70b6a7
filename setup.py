"""The optional native part of pydblog (everything else is in pyproject.toml).

``pydblog.sources.postgres._copyenc`` (C, no dependency but CPython's headers) encodes
snapshot chunks read as COPY text; ``optional=True``: a machine without a C compiler
or Python's headers still installs pydblog, which then reads chunks by the SQL path and
says so in its log. ``pydblog.changelog._kafkaread`` (C, the same) hands the Kafka
source a consume batch's values without a Python object per message; without it the
reads go through confluent-kafka's ``Message`` objects. ``pydblog.changelog._kafkawrite``
(C, the same) produces the Kafka writer's records and counts their acknowledgements (a
librdkafka interceptor plugin); without it the writer does both in Python.
``pydblog.sources.postgres._pgrow`` (C, the same) decodes the stream's row changes
straight into row dicts; without it they are decoded in Python.
``pydblog.sources.mysql._myrow`` (C, the same) decodes binlog rows events straight into
pydblog's values; without it they are decoded in Python (``fastrows``).
``pydblog.sources.mysql._mytext`` (C, the same) parses the values of result-set rows
(snapshot chunks); without it PyMySQL parses them (``textrows``).
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
        ),
        Extension(
            "pydblog.sources.postgres._pgrow",
            ["src/pydblog/sources/postgres/_pgrow.c"],
            extra_compile_args=["-O2", "-std=c99", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        ),
        Extension(
            "pydblog.sources.mysql._myrow",
            ["src/pydblog/sources/mysql/_myrow.c"],
            extra_compile_args=["-O2", "-std=c99", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        ),
        Extension(
            "pydblog.sources.mysql._mytext",
            ["src/pydblog/sources/mysql/_mytext.c"],
            extra_compile_args=["-O2", "-std=c99", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        ),
        Extension(
            "pydblog.changelog._kafkaread",
            ["src/pydblog/changelog/_kafkaread.c"],
            extra_compile_args=["-O2", "-std=c99", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            libraries=["dl"],
            optional=True,
        ),
        Extension(
            "pydblog.changelog._kafkawrite",
            ["src/pydblog/changelog/_kafkawrite.c", "src/pydblog/changelog/_kafkarecords.c"],
            depends=["src/pydblog/changelog/_kafkarecords.h"],
            extra_compile_args=["-O2", "-std=gnu99", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            libraries=["dl", "pthread"],
            optional=True,
        ),
    ]
)
