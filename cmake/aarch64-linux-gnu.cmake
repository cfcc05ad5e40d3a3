# Cross build for aarch64 Linux with Debian's g++-aarch64-linux-gnu; the arm64 libraries
# come from Debian's multiarch packages (libgtest-dev:arm64, libfmt-dev:arm64, ...), and
# the binaries run on an x86-64 machine under qemu-user (qemu-user-static), which CTest
# and gtest_discover_tests call through CMAKE_CROSSCOMPILING_EMULATOR.
# Used by scripts/build.sh aarch64.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# No -L /usr/aarch64-linux-gnu: its loader (libc6-arm64-cross) is not the same build as
# the multiarch libc6:arm64 the arm64 libraries bring, and threads hang when the two mix;
# the binaries' /lib/ld-linux-aarch64.so.1 is the multiarch one.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64-static)
