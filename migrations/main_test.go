package migrations_test

import (
	"testing"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/pgserver"
)

// TestMain runs the package's tests through pgserver.Main, which starts one PostgreSQL server
// for them at the first test that needs one (or uses the server of
// FENCELOCK_TEST_DATABASE_URL) and stops it afterwards. The tests are an external test package
// (migrations_test): pgserver imports package migrations, so only a test package of its own
// can import pgserver here.
func TestMain(m *testing.M) { pgserver.Main(m, fencelock.Migrate) }
