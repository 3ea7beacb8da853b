// Package liveview is the machinery of package ui, the live view in the browser.
//
// # Shape
//
//	database ──LiveViewSnapshot (1 statement / poll)──▶ Poller ──▶ View (one per poll)
//	                                                      │            │ fragments rendered once
//	                                                      ▼            ▼ per page (and name)
//	                                                  Timeline     Server: pages, event streams,
//	                                                  (memory)     POST release ──▶ writer pool
//
// The [Poller] reads one [Snapshot] per interval while a page is subscribed (or always), folds
// it into the [Timeline] of each lease name, and publishes a [View]; every open page's event
// stream waits for the next view and sends its page's fragment, rendered once per view. The
// [Server] serves the pages (html/template, embedded assets/), their event streams and the
// forced release, whose checks run in the order release.go gives.
//
// Nothing here writes but the forced release, through Config.Writer; the poller's statement
// only reads (sqlc/queries/liveview.sql).
package liveview
