#!/usr/bin/env bash
# Installs libibverbs (rdma-core's verbs library and providers) if it is
# missing, so that CI tests the RDMA transport's "library present, no
# device" path. Idempotent; never fails the caller: without the library the
# tests check the "library missing" path instead.
set -uo pipefail
if ldconfig -p 2>/dev/null | grep -q 'libibverbs\.so\.1 '; then
    echo "libibverbs.so.1 present"
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "libibverbs.so.1 missing (not root or no apt-get): RDMA tests check the missing-library path"
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y -qq libibverbs1 ibverbs-providers >/dev/null 2>&1; then
    apt-get update -qq >/dev/null 2>&1 || true
    apt-get install -y -qq libibverbs1 ibverbs-providers >/dev/null 2>&1 \
        || echo "installing libibverbs1 failed: RDMA tests check the missing-library path"
fi
ldconfig -p 2>/dev/null | grep -q 'libibverbs\.so\.1 ' && echo "libibverbs.so.1 installed"
exit 0
