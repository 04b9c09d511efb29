// sncl's device reduce kernels (written on the kernels branch). The ABI:
#define SNCL_MAX_ARGS 8
struct SnclReduceCopyArgs {
  const void* srcs[SNCL_MAX_ARGS];
  void* dsts[SNCL_MAX_ARGS];
  unsigned long long count;
  int nsrcs;
  int ndsts;
};
