# Sourced by scripts/fuzz and scripts/sanitize (not run): the one instrumented build directory,
# build-asan/, shared by the libFuzzer harnesses and the ASan + UBSan unit tests. clang,
# RelWithDebInfo, LSPO_FUZZ=ON: CMakeLists.txt then compiles everything with
# -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
# (coverage instrumentation for libFuzzer, ASan and UBSan that stop at the first report) and
# links with ASan + UBSan; the fuzz harnesses also link libFuzzer. The libraries both use
# (the parsers, protobuf's generated code) are compiled once.
LSPO_ASAN_BUILD=build-asan

# lspo_configure_asan_build LOG: configures build-asan/ unless it already is configured this
# way (a build-asan/ of another configuration is configured anew). Returns CMake's status.
lspo_configure_asan_build() {
  local log=$1
  mkdir -p "$LSPO_ASAN_BUILD"
  if [ -f "$LSPO_ASAN_BUILD/build.ninja" ] &&
     grep -q "^LSPO_FUZZ:BOOL=ON" "$LSPO_ASAN_BUILD/CMakeCache.txt" 2>/dev/null &&
     grep -q "^LSPO_BUILD_TESTS:BOOL=ON" "$LSPO_ASAN_BUILD/CMakeCache.txt" 2>/dev/null; then
    return 0
  fi
  rm -f "$LSPO_ASAN_BUILD/CMakeCache.txt"
  cmake -S . -B "$LSPO_ASAN_BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DLSPO_FUZZ=ON -DLSPO_BUILD_TESTS=ON -DLSPO_USE_PCH=OFF >> "$log" 2>&1
}
