package ratelimit_test

import (
	"github.com/fencelock/fencelock/internal/pgserver"
	"github.com/fencelock/fencelock/internal/testkit"
)

// The helpers of the limiter's server tests (limiter_test.go): the package's names for those
// every test package shares (internal/testkit).

// bundle is what most server tests need: a fresh migrated database, its pool (b.Pool) and a
// context (b.Ctx) that ends at test cleanup or after two minutes (testkit.Bundle).
type bundle = testkit.Bundle[*pgserver.DB]

// setup returns a bundle on a fresh database of the shared server.
var setup = testkit.Setup

// newPool returns a pool on url, closed at test cleanup.
var newPool = testkit.NewPool

// waitFor polls cond every 5 ms until it holds, failing the test when b's context ends first.
var waitFor = testkit.BundleWaitFor[*pgserver.DB]
