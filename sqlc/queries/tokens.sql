-- name: TokenEpochRebase :one
-- Raises fencelock.token_epoch.epoch_offset so that the next token's epoch is at least
-- @at_least and above every epoch in fencelock's tables and every recorded epoch
-- (fencelock.token_epoch.last_epoch, fencelock.token_epoch_marks); returns that epoch
-- (migrations 00003 and 00011).
SELECT fencelock.rebase_token_epoch(@at_least::integer)::integer AS epoch;
