"""Which certificate URLs the SNS verifier will fetch from."""

from __future__ import annotations

import pytest

from senddock.web.sns import SignatureError, is_sns_url, string_to_sign


@pytest.mark.parametrize(("url", "ok"), [
    ("https://sns.us-east-1.amazonaws.com/SimpleNotificationService-abc.pem", True),
    ("https://sns.eu-central-1.amazonaws.com/cert.pem", True),
    ("https://sns.us-gov-west-1.amazonaws.com/cert.pem", True),
    ("https://sns.cn-north-1.amazonaws.com.cn/cert.pem", True),
    ("http://sns.us-east-1.amazonaws.com/cert.pem", False),  # not HTTPS
    ("https://sns.s3.amazonaws.com/cert.pem", False),  # an S3 bucket named "sns"
    ("https://sns.s3-external-1.amazonaws.com/cert.pem", False),
    ("https://sns.us-east-1.amazonaws.com.evil.example/cert.pem", False),
    ("https://evil.example/sns.us-east-1.amazonaws.com/cert.pem", False),
])
def test_only_a_regions_sns_endpoint_over_https(url, ok):
    assert is_sns_url(url) is ok


def test_the_string_to_sign_follows_snss_field_order_and_skips_a_missing_subject():
    message = {"Type": "Notification", "MessageId": "m1", "TopicArn": "arn:aws:sns:us-east-1:1:t",
               "Message": "hello", "Timestamp": "2026-12-02T10:00:00Z", "Signature": "x", "SignatureVersion": "1"}
    assert string_to_sign(message) == (b"Message\nhello\nMessageId\nm1\nTimestamp\n2026-12-02T10:00:00Z\n"
                                       b"TopicArn\narn:aws:sns:us-east-1:1:t\nType\nNotification\n")
    with pytest.raises(SignatureError):
        string_to_sign({**message, "Type": "SubscriptionConfirmation"})  # lacks Token and SubscribeURL
