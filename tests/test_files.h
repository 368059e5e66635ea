// Test support shared by the unit and integration tests: whole-file reads and scratch files.
// Header-only; CMake tests include it through the source root, Bazel tests through
// //tests:test_files (linked into every lspo_test).
#ifndef LSPO_TESTS_TEST_FILES_H_
#define LSPO_TESTS_TEST_FILES_H_

#include <fstream>
#include <iterator>
#include <string>

#include "gtest/gtest.h"

namespace lspo::tests {

// The bytes of `path`; an empty string (and a failed EXPECT naming the path) when it cannot
// be opened, so that a missing oracle file fails the test instead of passing on empty input.
inline std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Writes `content` to ::testing::TempDir()/name (Bazel: $TEST_TMPDIR) and returns the path.
inline std::string TempFile(const std::string& name, const std::string& content) {
  std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

}  // namespace lspo::tests

#endif  // LSPO_TESTS_TEST_FILES_H_
