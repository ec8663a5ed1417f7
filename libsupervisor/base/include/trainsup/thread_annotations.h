// trainsup/thread_annotations.h — lock discipline the compiler checks.
//
// Contract: macros for Clang's -Wthread-safety analysis (as leveldb's port/thread_annotations.h
// and Abseil's): a member declared TRAINSUP_GUARDED_BY(mu_) may only be touched with mu_ held,
// a function declared TRAINSUP_REQUIRES(mu_) only called with it held, TRAINSUP_EXCLUDES(mu_)
// only without. They expand to nothing for other compilers; tests/layers/check_thread_safety.py
// (ctest layers.thread_safety) compiles libsupervisor with Clang and -Werror=thread-safety.
// Locks are trainsup::Mutex (trainsup/mutex.h): libstdc++'s std::mutex carries no annotations.
#pragma once

#if defined(__clang__)
#define TRAINSUP_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define TRAINSUP_THREAD_ANNOTATION(x)
#endif

#define TRAINSUP_CAPABILITY(name) TRAINSUP_THREAD_ANNOTATION(capability(name))
#define TRAINSUP_SCOPED_CAPABILITY TRAINSUP_THREAD_ANNOTATION(scoped_lockable)
#define TRAINSUP_GUARDED_BY(x) TRAINSUP_THREAD_ANNOTATION(guarded_by(x))
#define TRAINSUP_PT_GUARDED_BY(x) TRAINSUP_THREAD_ANNOTATION(pt_guarded_by(x))
#define TRAINSUP_ACQUIRED_AFTER(...) TRAINSUP_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
#define TRAINSUP_REQUIRES(...) TRAINSUP_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define TRAINSUP_ACQUIRE(...) TRAINSUP_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define TRAINSUP_RELEASE(...) TRAINSUP_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define TRAINSUP_EXCLUDES(...) TRAINSUP_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define TRAINSUP_ASSERT_CAPABILITY(x) TRAINSUP_THREAD_ANNOTATION(assert_capability(x))
#define TRAINSUP_RETURN_CAPABILITY(x) TRAINSUP_THREAD_ANNOTATION(lock_returned(x))
#define TRAINSUP_NO_THREAD_SAFETY_ANALYSIS TRAINSUP_THREAD_ANNOTATION(no_thread_safety_analysis)
