// trainsup/export.h — symbol visibility.
//
// libtrainsup is built with -fvisibility=hidden; only declarations marked TRAINSUP_EXPORT are
// part of the shared library's ABI.
#pragma once

#if defined(_WIN32)
#define TRAINSUP_EXPORT
#else
#define TRAINSUP_EXPORT __attribute__((visibility("default")))
#endif
