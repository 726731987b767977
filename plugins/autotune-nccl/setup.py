"""The plugin library, built as an extension module so that pip builds and installs it."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "autotune_nccl._tuner",
            sources=[
                "autotune_nccl/_tuner.c",
                "autotune_nccl/_profiler.c",
                "autotune_nccl/_profiler_chain.c",
            ],
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-fvisibility=hidden"],
            libraries=["pthread", "dl"],
        )
    ]
)
