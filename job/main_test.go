package job_test

import (
	"testing"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/pgserver"
)

// TestMain runs the package's tests and examples through pgserver.Main, which starts one
// PostgreSQL server for them at the first test that needs one (or uses the server of
// FENCELOCK_TEST_DATABASE_URL) and stops it afterwards.
func TestMain(m *testing.M) { pgserver.Main(m, fencelock.Migrate) }
