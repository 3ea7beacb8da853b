// Package fencetest holds the test helpers that drive fencelock's API, shared by the tests of
// the library's packages and of the test modules (internal/integration, internal/chaos): a
// lessor, election, semaphore or advisory locker made or failing the test, the receipt of an
// observer's states, an Acquire run in a goroutine of its own and its result awaited, the
// protected write of the fencing tests, one fencing token by each path that issues them
// ([TokenPaths]), and goose's contract tests for lockers on a lease.
//
// It imports the library, so package fencelock's internal tests cannot use it; they use
// [github.com/fencelock/fencelock/internal/testkit], which holds everything that needs no
// library. It never imports the packages above the root (job, gooselock, ratelimit), whose
// internal tests use it too.
package fencetest
