package fencelock

import (
	"io"
	"io/fs"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/migrations"
)

// TestPinnedMigrations: every migration Migrate gives goose starts its Up section with the
// statement that pins the search_path for its transaction, and is otherwise the file as
// embedded; its size is the text's.
func TestPinnedMigrations(t *testing.T) {
	t.Parallel()
	names, err := fs.Glob(pinnedMigrations{migrations.FS}, "*.sql")
	require.NoError(t, err)
	require.Greater(t, len(names), 16)
	for _, name := range names {
		orig, err := fs.ReadFile(migrations.FS, name)
		require.NoError(t, err)
		f, err := pinnedMigrations{migrations.FS}.Open(name)
		require.NoError(t, err)
		got, err := io.ReadAll(f)
		require.NoError(t, err)
		info, err := f.Stat()
		require.NoError(t, err)
		require.NoError(t, f.Close())
		require.Equal(t, int64(len(got)), info.Size(), name)
		const up = "-- +goose Up\n"
		require.Contains(t, string(got), up+pinnedSearchPathSQL, name)
		require.Equal(t, string(orig), strings.Replace(string(got), pinnedSearchPathSQL, "", 1), name)
	}
}
