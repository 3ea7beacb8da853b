package chaos

import (
	"os"
	"testing"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/pgtest"
)

// childEnv, when set, turns the test binary into a holder child process (see runChild)
// instead of running tests; its value is the child's JSON configuration.
const childEnv = "FENCELOCK_CHAOS_CHILD"

func TestMain(m *testing.M) {
	if cfg := os.Getenv(childEnv); cfg != "" {
		os.Exit(runChild(cfg))
	}
	if cfg := os.Getenv(semChildEnv); cfg != "" {
		os.Exit(runSemChild(cfg))
	}
	pgtest.Main(m)
}

func tok(n int64) fencelock.Token { return fencelock.Token(n) }
