"""ENTSO-E Transparency Platform documents as the API sends them, written for the local test server.

`gl_market_document` writes an A75 (actual generation per production type, process A16) `GL_MarketDocument`
with the namespace, header, `TimeSeries`, `MktPSRType`, `Period`, `resolution` and `Point` elements of the
Transparency Platform's documented schema (IEC 62325-451-6 generationloaddocument 3.0); `acknowledgement` writes
the `Acknowledgement_MarketDocument` it answers with when there is no data or the request is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from xml.sax.saxutils import escape

import pandas as pd

GL_NS = "urn:iec62325.351:tc57wg16:451-6:generationloaddocument:3:0"
ACK_NS = "urn:iec62325.351:tc57wg16:451-1:acknowledgementdocument:7:0"
DE_EIC = "10Y1001A1001A83F"
RESOLUTIONS = {"PT15M": pd.Timedelta(minutes=15), "PT30M": pd.Timedelta(minutes=30), "PT60M": pd.Timedelta(hours=1)}


@dataclass
class Series:
    """One TimeSeries: a production type, its direction and its points from `start` at `resolution`."""

    psr: str
    start: pd.Timestamp
    quantities: Sequence[float | None]  # None: the position is left out (a missing point)
    resolution: str = "PT15M"
    consumption: bool = False  # outBiddingZone_Domain: what the units consume (pumping)
    unit: str = "MAW"


def _time(ts: pd.Timestamp) -> str:
    return pd.Timestamp(ts).tz_convert("UTC").strftime("%Y-%m-%dT%H:%MZ")


def _quantity(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.3f}"


def gl_market_document(area: str, start: pd.Timestamp, end: pd.Timestamp, series: Sequence[Series]) -> str:
    """The GL_MarketDocument of `series` for zone EIC `area` over [start, end)."""
    out = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<GL_MarketDocument xmlns="{GL_NS}">',
        "  <mRID>6c1f2a0b8e3d4f7a9b5c0d1e2f3a4b5c</mRID>",
        "  <revisionNumber>1</revisionNumber>",
        "  <type>A75</type>",
        "  <process.processType>A16</process.processType>",
        '  <sender_MarketParticipant.mRID codingScheme="A01">10X1001A1001A450</sender_MarketParticipant.mRID>',
        "  <sender_MarketParticipant.marketRole.type>A32</sender_MarketParticipant.marketRole.type>",
        '  <receiver_MarketParticipant.mRID codingScheme="A01">10X1001A1001A450</receiver_MarketParticipant.mRID>',
        "  <receiver_MarketParticipant.marketRole.type>A33</receiver_MarketParticipant.marketRole.type>",
        f"  <createdDateTime>{_time(end).replace('Z', ':00Z')}</createdDateTime>",
        "  <time_Period.timeInterval>",
        f"    <start>{_time(start)}</start>",
        f"    <end>{_time(end)}</end>",
        "  </time_Period.timeInterval>",
    ]
    for number, ts in enumerate(series, start=1):
        step = RESOLUTIONS[ts.resolution]
        domain = "outBiddingZone_Domain.mRID" if ts.consumption else "inBiddingZone_Domain.mRID"
        out += [
            "  <TimeSeries>",
            f"    <mRID>{number}</mRID>",
            "    <businessType>A01</businessType>",
            "    <objectAggregation>A08</objectAggregation>",
            f'    <{domain} codingScheme="A01">{area}</{domain}>',
            f"    <quantity_Measure_Unit.name>{escape(ts.unit)}</quantity_Measure_Unit.name>",
            "    <curveType>A01</curveType>",
            "    <MktPSRType>",
            f"      <psrType>{ts.psr}</psrType>",
            "    </MktPSRType>",
            "    <Period>",
            "      <timeInterval>",
            f"        <start>{_time(ts.start)}</start>",
            f"        <end>{_time(ts.start + step * len(ts.quantities))}</end>",
            "      </timeInterval>",
            f"      <resolution>{ts.resolution}</resolution>",
        ]
        for position, value in enumerate(ts.quantities, start=1):
            if value is not None:
                out += [
                    "      <Point>",
                    f"        <position>{position}</position>",
                    f"        <quantity>{_quantity(value)}</quantity>",
                    "      </Point>",
                ]
        out += ["    </Period>", "  </TimeSeries>"]
    out.append("</GL_MarketDocument>")
    return "\n".join(out) + "\n"


def acknowledgement(text: str, code: str = "999") -> str:
    """An Acknowledgement_MarketDocument with one Reason (code 999 and "No matching data found ..." for no data)."""
    return "\n".join(
        [
            '<?xml version="1.0" encoding="UTF-8"?>',
            f'<Acknowledgement_MarketDocument xmlns="{ACK_NS}">',
            "  <mRID>0b6d4a3e-71c2-4f5e-9a8b-2c1d0e9f8a7b</mRID>",
            "  <createdDateTime>2021-07-01T06:00:00Z</createdDateTime>",
            '  <sender_MarketParticipant.mRID codingScheme="A01">10X1001A1001A450</sender_MarketParticipant.mRID>',
            "  <sender_MarketParticipant.marketRole.type>A32</sender_MarketParticipant.marketRole.type>",
            '  <receiver_MarketParticipant.mRID codingScheme="A01">10X1001A1001A450</receiver_MarketParticipant.mRID>',
            "  <receiver_MarketParticipant.marketRole.type>A39</receiver_MarketParticipant.marketRole.type>",
            "  <received_MarketDocument.createdDateTime>2021-07-01T06:00:00Z</received_MarketDocument.createdDateTime>",
            "  <Reason>",
            f"    <code>{code}</code>",
            f"    <text>{escape(text)}</text>",
            "  </Reason>",
            "</Acknowledgement_MarketDocument>",
        ]
    )


def no_matching_data(area: str, start: pd.Timestamp, end: pd.Timestamp) -> str:
    return acknowledgement(
        f"No matching data found for Data item ACTUAL_GENERATION_PER_PRODUCTION_TYPE [16.1.B&C] ({area}) and "
        f"interval {_time(start)}/{_time(end)}."
    )


SAMPLE_ORIGIN = pd.Timestamp("2021-07-01T00:00Z")


def de_sample(start: pd.Timestamp, end: pd.Timestamp) -> list[Series]:
    """A DE-like mix over [start, end): 15-min series, one hourly (PT60M) series, pumped storage both ways, and
    one missing 15-min point a day (lignite at 03:30). Values depend on the quarter-hour `i` counted from
    2021-07-01 00:00 UTC, so any requested period gets the same value for the same time."""
    quarters = pd.date_range(start, end, freq="15min", inclusive="left", tz="UTC")
    hours = pd.date_range(start, end, freq="h", inclusive="left", tz="UTC")
    index = [int((t - SAMPLE_ORIGIN) / pd.Timedelta(minutes=15)) for t in quarters]
    solar = [max(0.0, 900.0 * (t.hour + t.minute / 60 - 3.5)) for t in quarters]
    lignite: list[float | None] = [12000.0 + 40 * (i % 96) for i in index]
    for k, t in enumerate(quarters):
        if t.hour == 3 and t.minute == 30:
            lignite[k] = None
    return [
        Series("B01", start, [4500.0] * len(quarters)),
        Series("B02", start, lignite),
        Series("B04", start, [5200.0 + 10 * (i % 4) for i in index]),
        Series("B05", start, [3100.0 - 8 * (i % 96) for i in index]),
        Series("B10", start, [300.0] * len(quarters)),
        Series("B10", start, [900.0] * len(quarters), consumption=True),
        Series("B14", start, [8100.0] * len(quarters)),
        Series("B16", start, solar),
        Series("B19", start, [14000.0 - 100 * (i % 96) for i in index]),
        Series("B18", start, [3000.0] * len(hours), resolution="PT60M"),
        Series("B20", start, [250.0] * len(quarters)),
    ]
