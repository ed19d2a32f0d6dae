"""Table 7's regions, derived from the release's `birth_country` (the release stores no region).

The paper's regions (from the PRISM survey its users come from) follow the UN M49 geoscheme,
with the US and the UK as regions of their own, the rest of Northern America apart from the US,
Australia and New Zealand apart from the rest of Oceania, and the Middle East (Western Asia without
the Caucasus, plus Egypt and Iran) apart from Asia and Africa. Country names are matched exactly,
with the spellings the survey and the UN use.
"""

from __future__ import annotations

PREFER_NOT_TO_SAY = "Prefer not to say"
# The release's spelling of a withheld answer; the paper prints it as "Prefer not to say".
WITHHELD = ("N/A", PREFER_NOT_TO_SAY)
UNMAPPED = "Other"  # a country missing below; the stats output lists such names

_REGIONS: dict[str, tuple[str, ...]] = {
    "US": ("United States", "United States of America", "USA", "US"),
    "UK": ("United Kingdom", "UK", "United Kingdom of Great Britain and Northern Ireland", "England",
           "Scotland", "Wales", "Northern Ireland", "Great Britain"),
    "Northern America": ("Canada", "Bermuda", "Greenland", "Saint Pierre and Miquelon"),
    "Australia and New Zealand": ("Australia", "New Zealand"),
    "Oceania": ("Fiji", "Papua New Guinea", "Solomon Islands", "Vanuatu", "New Caledonia", "Samoa", "Tonga",
                "Kiribati", "Micronesia", "Marshall Islands", "Nauru", "Palau", "Tuvalu", "French Polynesia",
                "Guam", "Cook Islands", "American Samoa"),
    "Europe": (
        "Albania", "Andorra", "Austria", "Belarus", "Belgium", "Bosnia and Herzegovina", "Bulgaria", "Croatia",
        "Czech Republic", "Czechia", "Denmark", "Estonia", "Finland", "France", "Germany", "Greece", "Hungary",
        "Iceland", "Ireland", "Italy", "Kosovo", "Latvia", "Liechtenstein", "Lithuania", "Luxembourg", "Malta",
        "Moldova", "Republic of Moldova", "Monaco", "Montenegro", "Netherlands", "North Macedonia", "Macedonia",
        "Norway", "Poland", "Portugal", "Romania", "Russia", "Russian Federation", "San Marino", "Serbia",
        "Slovakia", "Slovenia", "Spain", "Sweden", "Switzerland", "Ukraine", "Vatican City", "Holy See",
        "Gibraltar", "Isle of Man", "Jersey", "Guernsey", "Faroe Islands"),
    "Latin America and the Caribbean": (
        "Antigua and Barbuda", "Argentina", "Bahamas", "Barbados", "Belize", "Bolivia", "Brazil", "Chile",
        "Colombia", "Costa Rica", "Cuba", "Dominica", "Dominican Republic", "Ecuador", "El Salvador", "Grenada",
        "Guatemala", "Guyana", "Haiti", "Honduras", "Jamaica", "Mexico", "Nicaragua", "Panama", "Paraguay",
        "Peru", "Puerto Rico", "Saint Kitts and Nevis", "Saint Lucia", "Saint Vincent and the Grenadines",
        "Suriname", "Trinidad and Tobago", "Uruguay", "Venezuela", "Aruba", "Curacao", "Curaçao",
        "Cayman Islands", "Martinique", "Guadeloupe", "French Guiana"),
    "Middle East": (
        "Bahrain", "Cyprus", "Egypt", "Iran", "Iraq", "Israel", "Jordan", "Kuwait", "Lebanon", "Oman", "Palestine",
        "State of Palestine", "Qatar", "Saudi Arabia", "Syria", "Syrian Arab Republic", "Turkey", "Türkiye",
        "United Arab Emirates", "Yemen"),
    "Africa": (
        "Algeria", "Angola", "Benin", "Botswana", "Burkina Faso", "Burundi", "Cabo Verde", "Cape Verde",
        "Cameroon", "Central African Republic", "Chad", "Comoros", "Congo", "Democratic Republic of the Congo",
        "Republic of the Congo", "Cote d'Ivoire", "Côte d'Ivoire", "Ivory Coast", "Djibouti", "Equatorial Guinea",
        "Eritrea", "Eswatini", "Swaziland", "Ethiopia", "Gabon", "Gambia", "Ghana", "Guinea", "Guinea-Bissau",
        "Kenya", "Lesotho", "Liberia", "Libya", "Madagascar", "Malawi", "Mali", "Mauritania", "Mauritius",
        "Morocco", "Mozambique", "Namibia", "Niger", "Nigeria", "Rwanda", "Sao Tome and Principe", "Senegal",
        "Seychelles", "Sierra Leone", "Somalia", "South Africa", "South Sudan", "Sudan", "Tanzania",
        "United Republic of Tanzania", "Togo", "Tunisia", "Uganda", "Zambia", "Zimbabwe"),
    "Asia": (
        "Afghanistan", "Armenia", "Azerbaijan", "Bangladesh", "Bhutan", "Brunei", "Cambodia", "China", "Georgia",
        "Hong Kong", "India", "Indonesia", "Japan", "Kazakhstan", "Kyrgyzstan", "Laos", "Macau", "Macao",
        "Malaysia", "Maldives", "Mongolia", "Myanmar", "Nepal", "North Korea", "Pakistan", "Philippines",
        "Singapore", "South Korea", "Korea", "Republic of Korea", "Sri Lanka", "Taiwan", "Tajikistan", "Thailand",
        "Timor-Leste", "Turkmenistan", "Uzbekistan", "Vietnam", "Viet Nam"),
}
_REGION_OF = {country: region for region, countries in _REGIONS.items() for country in countries}


def region_of(country: str) -> str:
    """The Table 7 region of a country of birth; withheld answers are "Prefer not to say"."""
    if country in WITHHELD:
        return PREFER_NOT_TO_SAY
    return _REGION_OF.get(country, UNMAPPED)
