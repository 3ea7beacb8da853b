// Package migrations holds fencelock's goose SQL migrations, embedded.
//
// [github.com/fencelock/fencelock.Migrate] applies them with goose's Provider and a version
// table of its own (fencelock.goose_db_version). An application that runs goose itself can
// instead copy the *.sql files of this directory into its own migrations directory, or pass
// [FS] to goose.NewProvider.
package migrations

import "embed"

// FS holds the migration files (NNNNN_name.sql, goose format) at its root. It is read-only and
// safe for concurrent use.
//
//go:embed *.sql
var FS embed.FS
