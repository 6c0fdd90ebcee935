package api

import "github.com/devicebridge/devicebridge/device"

// boardID is the device id a route's {id} names. A name an operator gave a
// board (Options.Named) comes first, so that a board cannot take it by
// choosing it as its id; otherwise {id} is a device id, a MAC in any
// spelling (MACs are awkward in URLs, and topic names use '_').
func (s *Server) boardID(ref string) string {
	if s.opts.Named != nil {
		if id, ok := s.opts.Named(ref); ok {
			return id
		}
	}
	return device.NormalizeID(ref)
}
