package io.bitlake.spark;

import java.io.ByteArrayInputStream;
import java.io.DataInputStream;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.util.HashMap;
import java.util.Map;

import org.apache.spark.sql.api.java.UDF2;
import org.roaringbitmap.RoaringBitmap;

/**
 * bitlake's row filter for Spark: {@code bitlake_keep(dropped, packed_row_id)} is false for the rows a read plan
 * drops. {@code dropped} is a literal of the plan's dropped offsets, per segment (bitlake/spark/reader.py writes
 * it): a big-endian int32 count, then per segment its packed row-id prefix (int64: part and seq, offset 0), the
 * length (int32) and the bitmap in the portable Roaring format pyroaring writes. A task parses the literal once:
 * every row of it passes the same byte array, so the parsed form is kept against that array's identity.
 */
public final class KeepRow implements UDF2<byte[], Long, Boolean> {
    private static final long serialVersionUID = 1L;
    private static final long OFFSET_MASK = (1L << 23) - 1;

    private static final class Parsed {
        final byte[] source;
        final Map<Long, RoaringBitmap> bySegment;
        long lastSegment = Long.MIN_VALUE;  // a task reads a file's rows in order: most rows hit the last segment
        RoaringBitmap last;

        Parsed(byte[] source, Map<Long, RoaringBitmap> bySegment) {
            this.source = source;
            this.bySegment = bySegment;
        }
    }

    private transient ThreadLocal<Parsed> parsed;

    @Override
    public Boolean call(byte[] dropped, Long packed) throws IOException {
        if (packed == null) {
            return true;  // as the join keeps it: a null id matches no dropped one
        }
        if (parsed == null) {
            parsed = new ThreadLocal<>();
        }
        Parsed p = parsed.get();
        if (p == null || p.source != dropped) {
            p = parse(dropped);
            parsed.set(p);
        }
        long segment = packed & ~OFFSET_MASK;
        if (segment != p.lastSegment) {
            p.lastSegment = segment;
            p.last = p.bySegment.get(segment);
        }
        return p.last == null || !p.last.contains((int) (packed & OFFSET_MASK));
    }

    private static Parsed parse(byte[] dropped) throws IOException {
        ByteBuffer in = ByteBuffer.wrap(dropped);
        int count = in.getInt();
        Map<Long, RoaringBitmap> bySegment = new HashMap<>(count * 2);
        for (int i = 0; i < count; i++) {
            long segment = in.getLong();
            int length = in.getInt();
            RoaringBitmap bitmap = new RoaringBitmap();
            bitmap.deserialize(new DataInputStream(new ByteArrayInputStream(dropped, in.position(), length)));
            in.position(in.position() + length);
            bySegment.put(segment, bitmap);
        }
        return new Parsed(dropped, bySegment);
    }
}
