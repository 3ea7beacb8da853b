package ui_test

import (
	"testing"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/pgserver"
)

// TestMain runs the package's tests through pgserver.Main, which starts one PostgreSQL server
// for them at the first test that needs one and stops it afterwards.
func TestMain(m *testing.M) { pgserver.Main(m, fencelock.Migrate) }
