"""Build step of the `lspo` package: generates the gRPC stubs from the repository's protos.

The protos import each other as "proto/<name>.proto" (the repository root is the include
path), so protoc writes modules that say `from proto import job_spec_pb2`. They are generated
into lspo/_gen/proto/ and those imports rewritten to `from lspo._gen.proto import ...`, so the
package owns no top-level module named `proto`. The generated files are never committed
(python/.gitignore); every build writes them anew from the protos it is built with.

The protos are taken from $LSPO_PROTO_DIR when set, else from ../proto beside this folder:
build from the repository's python/ folder (`pip install ./python`), not from a copy of it
alone.
"""
import os
import re
import shutil
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
# The protos the client needs: the scheduler service and the messages it imports.
PROTOS = ["job_spec", "metrics", "scheduler"]
SERVICES = ["scheduler"]
GENERATED_PACKAGES = ["lspo._gen", "lspo._gen.proto"]


def proto_dir():
    """The folder holding <name>.proto for every name in PROTOS (exits the build if none). It
    is named proto/: the protos import each other as "proto/<name>.proto"."""
    candidates = [os.environ.get("LSPO_PROTO_DIR", ""), os.path.join(HERE, "..", "proto")]
    for d in candidates:
        if d and all(os.path.isfile(os.path.join(d, p + ".proto")) for p in PROTOS):
            d = os.path.abspath(d)
            if os.path.basename(d) != "proto":
                sys.exit("lspo: LSPO_PROTO_DIR=%s: the folder must be the repository's proto/ "
                         "(the protos import each other as proto/<name>.proto)" % d)
            return d
    sys.exit("lspo: cannot find the protos (%s.proto) in $LSPO_PROTO_DIR or %s: build from "
             "the repository's python/ folder (pip install ./python), or set LSPO_PROTO_DIR to "
             "the repository's proto/ folder" % (", ".join(PROTOS),
                                                 os.path.join(HERE, "..", "proto")))


def generate(out_pkg):
    """Writes the *_pb2.py / *_pb2.pyi / *_pb2_grpc.py modules into `out_pkg`/_gen/proto."""
    from grpc_tools import protoc  # a build requirement (pyproject.toml)
    import grpc_tools

    src = proto_dir()
    root = os.path.dirname(src)  # the include path the protos' imports assume
    gen = os.path.join(out_pkg, "_gen")
    shutil.rmtree(gen, ignore_errors=True)
    os.makedirs(gen)
    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    for p in PROTOS:
        args = ["grpc_tools.protoc", "-I" + root, "-I" + well_known,
                "--python_out=" + gen, "--pyi_out=" + gen]
        if p in SERVICES:
            args.append("--grpc_python_out=" + gen)
        args.append("proto/%s.proto" % p)  # named as the protos import it
        if protoc.main(args) != 0:
            sys.exit("lspo: protoc failed on %s.proto (%s)" % (p, " ".join(args)))
    importer = re.compile(r"^from proto import ", re.M)
    for f in os.listdir(os.path.join(gen, "proto")):
        path = os.path.join(gen, "proto", f)
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(importer.sub("from lspo._gen.proto import ", text))
    for pkg in (gen, os.path.join(gen, "proto")):
        with open(os.path.join(pkg, "__init__.py"), "w", encoding="utf-8") as fh:
            fh.write('"""Generated at build time from the repository\'s protos (setup.py)."""\n')


class BuildWithStubs(build_py):
    """build_py that generates the stubs into the source package first (git-ignored there),
    so that wheels and editable installs both carry them."""

    def run(self):
        generate(os.path.join(HERE, "lspo"))
        # Declared here, not in pyproject.toml: they exist only once generated.
        for pkg in GENERATED_PACKAGES:
            if pkg not in self.packages:
                self.packages.append(pkg)
        self.package_data.setdefault("lspo._gen.proto", []).append("*.pyi")
        super().run()


setup(cmdclass={"build_py": BuildWithStubs})
