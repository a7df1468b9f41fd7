package nbd

import (
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
)

// errAborted ends a handshake the client aborted: not a failure.
var errAborted = errors.New("client aborted the handshake")

// negotiated is what the handshake settled for transmission.
type negotiated struct {
	// conn is the connection to transmit on: the TLS connection after
	// STARTTLS, else the accepted one.
	conn       net.Conn
	structured bool
}

// negotiate runs the fixed-newstyle handshake on nc until the client
// picks the export (NBD_OPT_GO or NBD_OPT_EXPORT_NAME), aborts, or breaks
// the protocol. It reads nothing past the option that ends it, so
// transmission (and a TLS upgrade) starts at the right byte.
func (s *Server) negotiate(nc net.Conn) (negotiated, error) {
	n := negotiated{conn: nc}
	greeting := binary.BigEndian.AppendUint64(nil, magicInit)
	greeting = binary.BigEndian.AppendUint64(greeting, magicOption)
	greeting = binary.BigEndian.AppendUint16(greeting, flagFixedNewstyle|flagNoZeroes)
	if _, err := nc.Write(greeting); err != nil {
		return n, fmt.Errorf("sending greeting: %w", err)
	}
	var cf [4]byte
	if _, err := io.ReadFull(nc, cf[:]); err != nil {
		return n, fmt.Errorf("reading client flags: %w", err)
	}
	clientFlags := binary.BigEndian.Uint32(cf[:])
	if clientFlags&clientFixedNewstyle == 0 {
		return n, errors.New("client does not speak fixed newstyle")
	}
	if clientFlags&^clientKnownFlags != 0 {
		return n, fmt.Errorf("unknown client flags %#x", clientFlags&^clientKnownFlags)
	}
	noZeroes := clientFlags&clientNoZeroes != 0
	tlsDone := false
	var hdr [optionHeaderBytes]byte
	for range maxOptions {
		if _, err := io.ReadFull(n.conn, hdr[:]); err != nil {
			return n, fmt.Errorf("reading option: %w", err)
		}
		h, err := parseOptionHeader(&hdr)
		if err != nil {
			return n, err
		}
		data := make([]byte, h.length)
		if _, err := io.ReadFull(n.conn, data); err != nil {
			return n, fmt.Errorf("reading option %d data: %w", h.option, err)
		}
		var out []byte
		reply := func(t uint32, d []byte) { out = appendOptionReply(out, h.option, t, d) }
		replyErr := func(t uint32, msg string) { reply(t, []byte(msg)) }
		done := false
		switch {
		case s.cfg.TLS != nil && !tlsDone && h.option != optStartTLS && h.option != optAbort:
			if h.option == optExportName {
				return n, errors.New("NBD_OPT_EXPORT_NAME before the required STARTTLS")
			}
			replyErr(repErrTLSReqd, "this server requires STARTTLS")
		case h.option == optExportName:
			if !s.knows(string(data)) {
				return n, fmt.Errorf("NBD_OPT_EXPORT_NAME for unknown export %q", data)
			}
			out = binary.BigEndian.AppendUint64(out, s.geo.size)
			out = binary.BigEndian.AppendUint16(out, s.flags)
			if !noZeroes {
				out = append(out, make([]byte, 124)...)
			}
			done = true
		case h.option == optAbort:
			reply(repAck, nil)
			_, _ = n.conn.Write(out) // the client may already be gone
			return n, errAborted
		case h.option == optList:
			if len(data) != 0 {
				replyErr(repErrInvalid, "NBD_OPT_LIST takes no data")
				break
			}
			reply(repServer, serverListData(s.cfg.Export.Name))
			reply(repAck, nil)
		case h.option == optStartTLS:
			switch {
			case len(data) != 0:
				replyErr(repErrInvalid, "NBD_OPT_STARTTLS takes no data")
			case s.cfg.TLS == nil:
				replyErr(repErrUnsup, "this server does not offer TLS")
			case tlsDone:
				replyErr(repErrInvalid, "TLS is already on")
			default:
				reply(repAck, nil)
				if _, err := n.conn.Write(out); err != nil {
					return n, fmt.Errorf("answering STARTTLS: %w", err)
				}
				out = nil
				tc := tls.Server(nc, s.cfg.TLS)
				if err := tc.Handshake(); err != nil {
					return n, fmt.Errorf("TLS handshake: %w", err)
				}
				n.conn, tlsDone = tc, true
				n.structured = false // nothing negotiated in clear survives the upgrade
			}
		case h.option == optInfo || h.option == optGo:
			req, err := parseExportRequest(data)
			if err != nil {
				replyErr(repErrInvalid, err.Error())
				break
			}
			if !s.knows(req.name) {
				replyErr(repErrUnknown, fmt.Sprintf("no export named %q", req.name))
				break
			}
			s.appendInfo(&out, h.option, req)
			reply(repAck, nil)
			done = h.option == optGo
		case h.option == optStructuredReply:
			if len(data) != 0 {
				replyErr(repErrInvalid, "NBD_OPT_STRUCTURED_REPLY takes no data")
				break
			}
			n.structured = true
			reply(repAck, nil)
		default:
			replyErr(repErrUnsup, fmt.Sprintf("option %d is not supported", h.option))
		}
		if len(out) > 0 {
			if _, err := n.conn.Write(out); err != nil {
				return n, fmt.Errorf("answering option %d: %w", h.option, err)
			}
		}
		if done {
			return n, nil
		}
	}
	return n, fmt.Errorf("more than %d options", maxOptions)
}

// knows reports whether name names the export ("" is the default one).
func (s *Server) knows(name string) bool {
	return name == "" || name == s.cfg.Export.Name
}

// appendInfo appends the NBD_REP_INFO replies of INFO or GO. Block sizes
// are sent whether or not the client asked: the export cannot serve
// requests below its block size.
func (s *Server) appendInfo(out *[]byte, option uint32, req exportRequest) {
	e := s.cfg.Export
	*out = appendOptionReply(*out, option, repInfo, infoExportData(e.Size, s.flags))
	*out = appendOptionReply(*out, option, repInfo, infoBlockSizeData(e.BlockSize, max(e.BlockSize, 4096), MaxRequestBytes))
	if req.wants(infoName) {
		*out = appendOptionReply(*out, option, repInfo, infoStringData(infoName, e.Name))
	}
	if req.wants(infoDescription) && e.Description != "" {
		*out = appendOptionReply(*out, option, repInfo, infoStringData(infoDescription, e.Description))
	}
}
