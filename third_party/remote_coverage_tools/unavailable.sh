#!/bin/sh
# Stub for Bazel's coverage tools in this offline setup.
echo "bazel coverage is unavailable in the offline Bazel 4.2.3 setup (third_party/remote_coverage_tools)" >&2
exit 1
