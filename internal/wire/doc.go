// Package wire holds the byte-level rules the protocol adapters (idemhttp,
// idemgrpc) share: the length-prefixed request hash behind their
// fingerprints and the framing of the records they store (a JSON envelope
// line, then the raw body).
//
// It is internal: its only users are this module's adapters, and idemgrpc,
// a nested module whose path shares this module's prefix. Changing a rule
// here changes stored fingerprints or records of every adapter at once,
// which is the point: the adapters cannot drift apart.
package wire
