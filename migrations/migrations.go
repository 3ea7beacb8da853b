// Package migrations holds fencelock's goose SQL migrations, embedded.
//
// [github.com/fencelock/fencelock.Migrate] applies them with goose's Provider and a version
// table of its own (fencelock.goose_db_version). An application that runs goose itself can
// instead copy the *.sql files of this directory into its own migrations directory, or pass
// [FS] to goose.NewProvider.
//
// # History and head
//
// The migrations are history: each says how a schema of its day became the next one, and a
// function or view may be defined in several of them, the last one winning. The SQL that runs
// today is in sqlc/schema.sql at the module's root: schema fencelock (tables, indexes, views,
// sequences, functions) as the last migration leaves it, dumped by pg_dump from a database
// that Migrate built. sqlc generates internal/db from it. It is generated, never edited: a
// change to the schema is a new migration, then
//
//	FENCELOCK_UPDATE_SCHEMA=1 go test -count=1 -run TestHeadSchemaIsCurrent github.com/fencelock/fencelock/migrations/
//
// rewrites it; TestHeadSchemaIsCurrent, which CI runs, fails while it differs from what the
// migrations give.
package migrations

import "embed"

// FS holds the migration files (NNNNN_name.sql, goose format) at its root. It is read-only and
// safe for concurrent use.
//
//go:embed *.sql
var FS embed.FS
