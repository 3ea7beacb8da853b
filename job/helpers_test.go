package job_test

import (
	"github.com/fencelock/fencelock/internal/pgserver"
	"github.com/fencelock/fencelock/internal/testkit"
	"github.com/fencelock/fencelock/internal/testkit/fencetest"
)

// The helpers of the job's server tests (slot_test.go, job_gone_test.go): the package's names
// for those every test package shares (internal/testkit, internal/testkit/fencetest).

// bundle is what most server tests need: a fresh migrated database, its pool (b.Pool) and a
// context (b.Ctx) that ends at test cleanup or after two minutes (testkit.Bundle).
type bundle = testkit.Bundle[*pgserver.DB]

// setup returns a bundle on a fresh database of the shared server.
var setup = testkit.Setup

// newLessor returns a lessor on pool with holder id holder and opts, failing the test on error.
var newLessor = fencetest.NewLessor

// waitFor polls cond every 5 ms until it holds, failing the test when b's context ends first.
var waitFor = testkit.BundleWaitFor[*pgserver.DB]
